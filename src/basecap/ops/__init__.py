"""Pure-PyTorch kernels shared by mixers (scans, chunked delta rule, short convolutions...)."""
