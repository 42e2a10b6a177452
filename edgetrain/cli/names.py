"""The command line's names of the losses and optimizers: --loss NAME -> the loss class in edgetrain.derive.losses;
--optimizer NAME -> its default learning rate."""

LOSSES = {
    "cross-entropy": "CrossEntropyLoss",
    "next-token": "NextTokenLoss",
    "mse": "MSELoss",
    "l1": "L1Loss",
    "bce": "BCEWithLogitsLoss",
}
DEFAULT_LR = {"sgd": 0.01, "adam": 0.001, "adamw": 0.001}
