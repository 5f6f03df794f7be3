"""A user's own algorithm against the public API: REINFORCE with a mean baseline, no gymllm internals.

The vector env is used like any Gymnasium vector env, the engine samples, the model scores:

    python examples/custom_algorithm.py --steps 30
"""

import argparse
import asyncio

import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

import gymllm
from gymllm.inference import EngineConfig, JaxEngine, SamplingParams
from gymllm.models import make_tiny, token_logprobs


def pad(rows, pad_id):  # list of id lists -> [B, T] tokens and a [B, T] validity mask
    T = max(map(len, rows))
    ids = np.full((len(rows), T), pad_id, np.int32)
    valid = np.zeros((len(rows), T), np.float32)
    for i, r in enumerate(rows):
        ids[i, : len(r)], valid[i, : len(r)] = r, 1.0
    return jnp.asarray(ids), jnp.asarray(valid)


def reinforce_loss(model, ids, sampled_mask, advantages):  # ids [B, T]; mask [B, T]; advantages [B]
    positions = jnp.broadcast_to(jnp.arange(ids.shape[1]), ids.shape)
    logits, _ = model(ids[:, :-1], positions[:, :-1])  # [B, T-1, V]
    logp = token_logprobs(logits, ids[:, 1:])  # [B, T-1]: log pi(token t+1 | prefix)
    mask = sampled_mask[:, 1:]
    return -jnp.sum(logp * mask * advantages[:, None]) / jnp.maximum(mask.sum(), 1.0)


@nnx.jit
def train_step(model, optimizer, ids, mask, adv):
    loss, grads = nnx.value_and_grad(reinforce_loss)(model, ids, mask, adv)
    optimizer.update(model, grads)
    return loss


async def main(steps: int, num_envs: int, seed: int) -> list[float]:
    loaded = make_tiny("llama", seed=seed)
    model, tok = loaded.model, loaded.tokenizer
    optimizer = nnx.Optimizer(model, optax.adam(3e-3), wrt=nnx.Param)
    engine = JaxEngine.from_loaded(loaded, config=EngineConfig(num_slots=num_envs, max_len=128))
    envs = gymllm.make_vec("gymllm/TinyRepeat-v0", num_envs=num_envs)
    params = SamplingParams(temperature=1.0, max_tokens=8)
    curve = []
    for step in range(steps):
        obs, _ = envs.reset(seed=seed + step)
        prompts = [
            tok.apply_chat_template(
                [{"role": "user", "content": o}], add_generation_prompt=True, tokenize=True
            )
            for o in obs
        ]
        outs = await asyncio.gather(*(engine.generate(p, params) for p in prompts))
        actions = [
            tok.decode([t for t in o.token_ids if t not in tok.stop_token_ids]) for o in outs
        ]
        _, rewards, *_ = envs.step(actions)
        adv = jnp.asarray(rewards - rewards.mean(), jnp.float32)  # the mean baseline
        ids, valid = pad(
            [list(p) + list(o.token_ids) for p, o in zip(prompts, outs)], tok.pad_token_id
        )
        sampled = valid * (
            jnp.arange(ids.shape[1])[None, :] >= jnp.asarray([len(p) for p in prompts])[:, None]
        )
        train_step(model, optimizer, ids, sampled, adv)
        engine.update_weights(nnx.state(model, nnx.Param), version=step + 1)
        curve.append(float(np.mean(rewards)))
        print(f"step {step:3d}  reward {curve[-1]:.3f}", flush=True)
    await engine.close()
    envs.close()
    return curve


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--num-envs", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    asyncio.run(main(a.steps, a.num_envs, a.seed))
