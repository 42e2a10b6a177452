"""The command line's names: --loss NAME -> the loss class in edgetrain.derive.losses; --optimizer NAME -> its
default learning rate; an option's name from its name in a configuration or a checkpoint."""

LOSSES = {
    "cross-entropy": "CrossEntropyLoss",
    "next-token": "NextTokenLoss",
    "mse": "MSELoss",
    "l1": "L1Loss",
    "bce": "BCEWithLogitsLoss",
}
DEFAULT_LR = {"sgd": 0.01, "adam": 0.001, "adamw": 0.001}


def flag(dest: str) -> str:
    """An option's name on the command line from its name in a config or a checkpoint: val_split -> --val-split."""
    return "--" + dest.replace("_", "-")
