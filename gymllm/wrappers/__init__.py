"""gymllm.wrappers"""
