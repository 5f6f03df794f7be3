"""gymllm.cli"""
