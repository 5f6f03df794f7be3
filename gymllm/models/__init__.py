"""gymllm.models"""
