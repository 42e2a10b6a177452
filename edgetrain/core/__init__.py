"""The core (numpy only; imports nothing else of edgetrain): the errors, the IR, the op records, the kernels, the
interpreter, the memory plan's format and check, and the file container."""
