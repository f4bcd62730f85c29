"""Engine adapters (PyTorch, MindSpore) and the bundled Llama-style engine."""
