"""Tunix peer runner for ``benchmarks/peers.py``: one GRPO run of Tunix 0.1.7 on the shared spec.

Runs inside the Tunix virtualenv (``requirements-tunix.txt``), never imports gymllm. Reads the spec
JSON that ``peers.py`` writes (model sizes, prompts, token budget, optimizer; see ``peers.py``'s
``peer_spec``) and ``--mode batch`` (``tunix.rl.grpo.grpo_learner.GRPOLearner``: one batched
rollout per step) or ``--mode agentic`` (``tunix.rl.agentic.agentic_grpo_learner.GRPOLearner``:
one coroutine per episode, single turn). The model is Tunix's own Qwen3 (``tunix.models.qwen3``)
with random init; the tokenizer is the shared byte-level BPE (``tokenizer.json``) wrapped in the
small adapter Tunix accepts (encode / decode / bos_id / eos_id / pad_id). Actor, reference and
sampler share the one CPU device (colocated).

A step's time is the wall between two consecutive pulls of the training iterator (the learner
pulls the next batch when it starts a step), the last step ending when ``train`` returns. Prints
``RESULT {json}``: ``step_s`` (per step), ``mean_step_s`` (mean after the warm-up steps),
``versions``, ``reward_mean``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

# JAX_PLATFORMS: as benchmarks/peers.py (or the user) gives it; peers.py --cpu pins the CPU


class ByteTokenizer:
    """The shared ``tokenizer.json`` with the methods Tunix's TokenizerAdapter asks for."""

    def __init__(self, path: str, *, eos: str, pad: str):
        from tokenizers import Tokenizer

        self.tok = Tokenizer.from_file(path)
        self._eos, self._pad = self.tok.token_to_id(eos), self.tok.token_to_id(pad)
        self.eos_token, self.pad_token, self.bos_token = (
            eos,
            pad,
            None,
        )  # read by Tunix's chat parsers

    def encode(self, text, **kwargs):
        return self.tok.encode(str(text), add_special_tokens=False).ids

    def decode(self, ids, **kwargs):
        return self.tok.decode([int(i) for i in ids], skip_special_tokens=True)

    def bos_id(self):
        return self._pad  # no BOS in the ChatML prompts; Tunix only dedups leading BOS ids

    def eos_id(self):
        return self._eos

    def pad_id(self):
        return self._pad


def letter_fraction(reply: str, letter: str) -> float:
    chars = [c for c in reply if not c.isspace()]
    return sum(c == letter for c in chars) / len(chars) if chars else 0.0


def build_cluster(spec: dict, tokenizer: ByteTokenizer, mode: str):
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax
    from flax import nnx
    from tunix.models.qwen3 import model as qwen3
    from tunix.rl import rl_cluster as rl_cluster_lib
    from tunix.rl.rollout import base_rollout

    m = spec["model"]
    cfg = qwen3.ModelConfig(
        num_layers=m["num_layers"],
        vocab_size=m["vocab_size"],
        embed_dim=m["hidden_size"],
        hidden_dim=m["intermediate_size"],
        num_heads=m["num_heads"],
        head_dim=m["head_dim"],
        num_kv_heads=m["num_kv_heads"],
        rope_theta=int(m["rope_theta"]),
        norm_eps=m["rms_norm_eps"],
        use_tied_embedding=m["tie_word_embeddings"],
        dtype=jnp.float32,
        param_dtype=jnp.float32,
    )
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ("fsdp", "tp"))
    with mesh:
        reference = qwen3.Qwen3(cfg, rngs=nnx.Rngs(spec["seed"]))
        graph_def, params = nnx.split(reference)
        actor = nnx.merge(graph_def, jax.tree.map(jnp.copy, params))
    s = spec["sampling"]
    rollout = base_rollout.RolloutConfig(
        max_tokens_to_generate=s["max_new_tokens"],
        temperature=s["temperature"],
        top_p=1.0,
        top_k=None,
        max_prompt_length=s["max_prompt_tokens"],
        kv_cache_size=s["max_prompt_tokens"] + s["max_new_tokens"] + 32,
        eos_tokens=[tokenizer.eos_id()],
        seed=int(spec["seed"]),  # an int: a key array is donated after one call
        return_logprobs=(mode == "agentic"),
    )  # the agentic learner requires them
    o = spec["optimizer"]
    training = rl_cluster_lib.RLTrainingConfig(
        actor_optimizer=optax.chain(
            optax.clip_by_global_norm(o["max_grad_norm"]),
            optax.adamw(
                o["learning_rate"],
                b1=o["b1"],
                b2=o["b2"],
                eps=o["eps"],
                weight_decay=o["weight_decay"],
            ),
        ),
        eval_every_n_steps=10**9,
        max_steps=spec["steps"],
        mini_batch_size=None,
        train_micro_batch_size=None,
    )
    cluster_config = rl_cluster_lib.ClusterConfig(
        role_to_mesh={
            rl_cluster_lib.Role.ACTOR: mesh,
            rl_cluster_lib.Role.REFERENCE: mesh,
            rl_cluster_lib.Role.ROLLOUT: mesh,
        },
        rollout_engine="vanilla",
        offload_to_cpu=False,
        training_config=training,
        rollout_config=rollout,
    )
    return rl_cluster_lib.RLCluster(
        actor=actor, reference=reference, tokenizer=tokenizer, cluster_config=cluster_config
    )


class TimedBatches:
    """The training iterator: one batch of ``num_prompts`` prompts per step; records when each is pulled."""

    def __init__(self, spec: dict, mode: str):
        self.spec, self.mode, self.pulls = spec, mode, []

    def __iter__(self):
        import numpy as np

        n = self.spec["num_prompts"]
        for step in range(self.spec["steps"]):
            rows = self.spec["prompts"][step * n : (step + 1) * n]
            self.pulls.append(time.perf_counter())
            # arrays, not lists: Tunix repeats each leaf G times with np.repeat (a list's strings would be leaves)
            key = (
                "text" if self.mode == "batch" else "user"
            )  # agentic: the parser applies the template
            yield {
                "prompts": np.array([r[key] for r in rows]),
                "answer": np.array([r["answer"] for r in rows]),
            }


def run(spec: dict, mode: str) -> dict:
    import importlib.metadata as md

    import numpy as np

    tokenizer = ByteTokenizer(spec["tokenizer_file"], eos=spec["eos_token"], pad=spec["pad_token"])
    cluster = build_cluster(spec, tokenizer, mode)
    g = spec["group_size"]
    rewards: list[float] = []

    def reward(prompts, completions, answer=None, **kwargs):
        # batch learner: answers repeated per completion (Tunix repeats the batch's other keys G times)
        out = [letter_fraction(c, a) for c, a in zip(completions, answer)]
        rewards.extend(out)
        return out

    a = spec["algo"]
    if mode == "batch":
        from tunix.rl.grpo import grpo_learner

        algo = grpo_learner.GRPOConfig(
            num_generations=g,
            num_iterations=1,
            beta=a["beta"],
            epsilon=a["epsilon"],
            loss_agg_mode="sequence-mean-token-mean",
        )
        learner = grpo_learner.GRPOLearner(
            rl_cluster=cluster, algo_config=algo, reward_fns=[reward]
        )
    else:
        from tunix.rl.agentic import agentic_grpo_learner as agl

        learner = make_agentic(agl, cluster, spec, reward, tokenizer)
    batches = TimedBatches(spec, mode)
    updates: list[float] = []
    update_actor = cluster.update_actor

    def timed_update_actor(*args, **kwargs):
        out = update_actor(*args, **kwargs)
        updates.append(time.perf_counter())
        return out

    cluster.update_actor = timed_update_actor
    start = time.perf_counter()
    learner.train(batches)
    end = time.perf_counter()
    if (
        len(updates) == spec["steps"]
    ):  # one optimizer update per step: step i ends when its update returns
        marks, clock = [start] + updates, "update_actor returns"
    else:
        marks, clock = batches.pulls + [end], "iterator pulls"
    step_s = [marks[i + 1] - marks[i] for i in range(len(marks) - 1)]
    w = spec["warmup_steps"]
    return {
        "side": f"tunix_{mode}",
        "steps": len(step_s),
        "step_s": step_s,
        "clock": clock,
        "updates": len(updates),
        "mean_step_s": float(np.mean(step_s[w:])) if len(step_s) > w else None,
        "reward_mean": float(np.mean(rewards)) if rewards else None,
        "completions": len(rewards),
        "versions": {p: md.version(p) for p in ("google-tunix", "jax", "jaxlib", "flax", "optax")},
    }


def make_agentic(agl, cluster, spec, reward, tokenizer):
    """Tunix's agentic GRPO: ModelAgent + TaskEnvironment (single turn, one coroutine per episode),
    Qwen's ChatML parser with the same system prompt gymllm's template adds (the same prompt tokens)."""
    from tunix.rl.agentic.parser.chat_template_parser import parser as chat_parser_lib

    a = spec["algo"]
    algo = agl.GRPOConfig(
        num_generations=spec["group_size"],
        num_iterations=1,
        beta=a["beta"],
        epsilon=a["epsilon"],
        loss_agg_mode="sequence-mean-token-mean",
        system_prompt=spec["system_prompt"],
        max_concurrency=spec["num_prompts"] * spec["group_size"],
        off_policy_steps=0,
        max_response_length=spec["sampling"]["max_new_tokens"],
    )
    # rewards: the same function on the completions as the batch learner (the agentic learner's
    # reward manager scores completions with reward_fns; TaskEnvironment's own reward is not used)
    return agl.GRPOLearner(
        rl_cluster=cluster,
        algo_config=algo,
        reward_fns=[reward],
        chat_parser=chat_parser_lib.QwenChatTemplateParser(tokenizer),
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--spec", required=True, help="spec JSON written by benchmarks/peers.py")
    ap.add_argument("--mode", choices=("batch", "agentic"), default="batch")
    args = ap.parse_args()
    with open(args.spec) as f:
        spec = json.load(f)
    print("RESULT " + json.dumps(run(spec, args.mode)), flush=True)
    sys.stdout.flush()
    os._exit(0)  # Tunix leaves non-daemon threads (metrics, prefetch) behind


if __name__ == "__main__":
    main()
