"""The build side: an inference Graph extended in place into a training step (parameter roles, ILoss, autodiff,
IOptimizer), planned and written as an artifact; `check`. Numpy only for an IR graph; ONNX files need onnx."""
