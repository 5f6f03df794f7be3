"""gymllm.rollout"""
