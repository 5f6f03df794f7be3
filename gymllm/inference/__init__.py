"""gymllm.inference"""
