"""Names users choose among, in one light module (the CLI's choices load nothing heavy)."""

METRICS = ("euclidean", "cosine")
# GEMM precisions of the GPU kernels (labels are exact in all of them; see backends.cupy_backend).
PRECISIONS = ("fp32", "tf32", "bf16")
