"""ONNX at the edges (needs onnx): a ModelProto read into the IR, the IR written back as ONNX. The build side
imports it; the device side only inside the two functions that read or write ONNX files."""
