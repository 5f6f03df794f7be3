"""gymllm.algos"""
