"""chainrt inference workers: engines (llama.cpp, vLLM, torch) and the worker HTTP service."""
