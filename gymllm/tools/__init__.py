"""gymllm.tools"""
