"""The bundled mini model family ("zoo"): registry, workloads and training recipe."""
