"""The on-phone personalization app (numpy and edgetrain's device side only): a sample store, bursts of training
kept only when validation says they help, model versions, a page for the phone's browser, and `simulate`.

    python -m android_demo --home DIR init --artifact MODEL.etrain      (or init --text: a keyboard, android_demo.text)
    python -m android_demo --home DIR add --sentences FILE             (a text home; suggest "TEXT" gives 3 words)
    python -m android_demo --home DIR add --data PATH
    python -m android_demo --home DIR personalize [--max-steps N] [--lr X] [--threads N] [--batch-size B] [--json]
    python -m android_demo --home DIR evaluate --data PATH [--json]
    python -m android_demo --home DIR status [--json]
    python -m android_demo --home DIR serve [--port P]
    python -m android_demo simulate [--quick] [--json]

Importing this package imports nothing heavy: the command line sets the thread count before numpy loads.
"""

__all__ = ["AppError", "BurstResult", "Home"]


def __getattr__(name):  # Home and friends load numpy and edgetrain: only when asked for
    if name in __all__:
        from . import app  # start-up: numpy and edgetrain load with it, only when one of these names is used

        return getattr(app, name)
    raise AttributeError(name)
