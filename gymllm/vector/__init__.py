"""gymllm.vector"""
