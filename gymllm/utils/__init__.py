"""gymllm.utils"""
