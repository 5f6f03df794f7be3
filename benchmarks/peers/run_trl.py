"""TRL peer runner for ``benchmarks/peers.py``: one run of TRL's ``GRPOTrainer`` (CPU PyTorch) on the shared spec.

Runs inside the TRL virtualenv (``requirements-trl.txt``: ``torch==2.13.0+cpu``), never imports
gymllm. The model is transformers' ``Qwen3ForCausalLM`` built from a ``Qwen3Config`` with the
spec's sizes (random init, float32, tied embeddings); the tokenizer is the shared byte-level BPE
(``tokenizer.json``) in a ``PreTrainedTokenizerFast``; the dataset holds the spec's templated
prompts (plain text: TRL tokenizes them as they are, the same ids as every other side). GRPO:
``num_generations`` G, ``per_device_train_batch_size`` = prompts x G (one optimizer step per
generation batch), ``loss_type="grpo"`` (sequence-mean-token-mean), beta with a reference model,
AdamW, ``use_vllm=False`` (generation with ``model.generate``).

A step's time is the wall between two ``on_step_end`` callbacks (the first from ``on_train_begin``).
Prints ``RESULT {json}``: ``step_s``, ``mean_step_s`` (after the warm-up steps), ``versions``.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def letter_fraction(reply: str, letter: str) -> float:
    chars = [c for c in reply if not c.isspace()]
    return sum(c == letter for c in chars) / len(chars) if chars else 0.0


def run(spec: dict) -> dict:
    import importlib.metadata as md

    import numpy as np
    import torch
    from datasets import Dataset
    from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.manual_seed(spec["seed"])
    m, s, o, a = spec["model"], spec["sampling"], spec["optimizer"], spec["algo"]
    tok = PreTrainedTokenizerFast(
        tokenizer_file=spec["tokenizer_file"],
        eos_token=spec["eos_token"],
        pad_token=spec["pad_token"],
        padding_side="left",
    )
    cfg = Qwen3Config(
        vocab_size=m["vocab_size"],
        hidden_size=m["hidden_size"],
        intermediate_size=m["intermediate_size"],
        num_hidden_layers=m["num_layers"],
        num_attention_heads=m["num_heads"],
        num_key_value_heads=m["num_kv_heads"],
        head_dim=m["head_dim"],
        rope_theta=m["rope_theta"],
        rms_norm_eps=m["rms_norm_eps"],
        tie_word_embeddings=m["tie_word_embeddings"],
        max_position_embeddings=2048,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        bos_token_id=None,
        torch_dtype="float32",
    )
    model = Qwen3ForCausalLM(cfg).to(torch.float32)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    n, g = spec["num_prompts"], spec["group_size"]
    rows = spec["prompts"][: spec["steps"] * n]
    ds = Dataset.from_dict(
        {"prompt": [r["text"] for r in rows], "answer": [r["answer"] for r in rows]}
    )
    rewards: list[float] = []

    def reward(prompts, completions, answer, **kwargs):
        out = [letter_fraction(c, x) for c, x in zip(completions, answer)]
        rewards.extend(out)
        return out

    marks: list[float] = []

    class Clock(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            marks.append(time.perf_counter())

        def on_step_end(self, args, state, control, **kwargs):
            marks.append(time.perf_counter())

    with tempfile.TemporaryDirectory(prefix="trl-peer-") as tmp:
        # TRL builds the reference model from the policy's path: save the random model, pass the path
        model.save_pretrained(f"{tmp}/model")
        args = GRPOConfig(
            output_dir=f"{tmp}/out",
            max_steps=spec["steps"],
            per_device_train_batch_size=n * g,
            gradient_accumulation_steps=1,
            num_generations=g,
            steps_per_generation=1,
            max_completion_length=s["max_new_tokens"],
            temperature=s["temperature"],
            top_p=1.0,
            top_k=0,
            beta=a["beta"],
            epsilon=a["epsilon"],
            loss_type="grpo",
            num_iterations=1,
            learning_rate=o["learning_rate"],
            adam_beta1=o["b1"],
            adam_beta2=o["b2"],
            adam_epsilon=o["eps"],
            weight_decay=o["weight_decay"],
            max_grad_norm=o["max_grad_norm"],
            lr_scheduler_type="constant",
            warmup_steps=0,
            use_vllm=False,
            use_cpu=True,
            bf16=False,
            fp16=False,
            report_to="none",
            save_strategy="no",
            logging_steps=10**6,
            dataloader_num_workers=0,
            seed=spec["seed"],
            disable_tqdm=True,
            shuffle_dataset=False,
            model_init_kwargs={"dtype": torch.float32},
        )
        trainer = GRPOTrainer(
            model=f"{tmp}/model",
            reward_funcs=reward,
            args=args,
            train_dataset=ds,
            processing_class=tok,
            callbacks=[Clock()],
        )
        trainer.train()
    step_s = [marks[i + 1] - marks[i] for i in range(len(marks) - 1)]
    w = spec["warmup_steps"]
    return {
        "side": "trl",
        "steps": len(step_s),
        "step_s": step_s,
        "mean_step_s": float(np.mean(step_s[w:])) if len(step_s) > w else None,
        "reward_mean": float(np.mean(rewards)) if rewards else None,
        "completions": len(rewards),
        "torch_threads": torch.get_num_threads(),
        "versions": {p: md.version(p) for p in ("trl", "transformers", "torch", "accelerate")},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--spec", required=True, help="spec JSON written by benchmarks/peers.py")
    ap.add_argument("--mode", default="grpo", choices=("grpo",))
    args = ap.parse_args()
    with open(args.spec) as f:
        spec = json.load(f)
    print("RESULT " + json.dumps(run(spec)), flush=True)


if __name__ == "__main__":
    main()
