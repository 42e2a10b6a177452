"""edgetrain's fused backward kernels for convolution and pooling (domain com.edgetrain; placeholder)."""
