"""gymllm.envs"""
