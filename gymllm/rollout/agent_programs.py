"""Agent programs for ``rollout.mode="proxy"``: subprocesses that play episodes against the training
proxy, and the :class:`~gymllm.rollout.sources.GroupSource` that turns their closed sessions into groups.

    source = AgentProgramSource(engine, tokenizer, command=cfg.rollout.agent_program, run_dir=run_dir,
                                config=ProxySourceConfig(group_size=4, max_queued_groups=8, max_staleness=1),
                                processes=2, seed=0, start_timeout_s=300.0, group_filter=keep)
    await source.start()         # serves `engine` on 127.0.0.1 (a free port), starts the programs
    groups = await source.next_groups()
    await source.close()         # stops the programs (SIGTERM, then SIGKILL), then the server

A program that exits with an error, or no closed session within ``start_timeout_s``, fails the run:
``next_groups`` raises :class:`AgentProgramError` with the program's log tail. Programs that all
exit with status 0 end the source (``QueueClosed``; the run stops early with a warning).
"""

from __future__ import annotations

import asyncio
import pathlib
import time
from typing import Any, Callable

from gymllm.errors import ConfigError, GymLLMError, explain
from gymllm.rollout.group_queue import QueueClosed
from gymllm.rollout.proxy_source import ProxyGroupSource, ProxySourceConfig
from gymllm.types import Group

__all__ = ["AgentPrograms", "AgentProgramError", "AgentProgramSource"]


class AgentProgramError(GymLLMError, RuntimeError):
    """The agent program of a proxy-mode run exited with an error or closed no session in time."""


class AgentPrograms:
    """``processes`` copies of an agent program (a command line, see ``RolloutConfig.agent_program``)
    as subprocesses of this one, each in its own process group, output to ``run_dir/agent_<i>.log``.

    ``start()``; ``await watch(source)`` until a program fails (the source is then closed, so the
    trainer's wait ends) or all exited cleanly; ``raise_error()`` raises what ``watch`` found;
    ``stop()`` terminates them (SIGTERM to the group, then SIGKILL after ``grace_s``) and reaps them."""

    def __init__(
        self,
        command: str,
        *,
        base_url: str,
        run_dir: pathlib.Path,
        processes: int = 1,
        group_size: int = 1,
        seed: int = 0,
        start_timeout_s: float = 300.0,
        api_key: str = "unused",
        model: str = "policy",
        grace_s: float = 5.0,
        poll_s: float = 0.1,
    ):
        self.command, self.base_url, self.run_dir = command, base_url, pathlib.Path(run_dir)
        self.processes, self.group_size, self.seed = processes, group_size, seed
        self.start_timeout_s, self.api_key, self.model = start_timeout_s, api_key, model
        self.grace_s, self.poll_s = grace_s, poll_s
        self.procs: list[Any] = []
        self.logs: list[pathlib.Path] = []
        self.error: str | None = None

    def argv(self, index: int) -> list[str]:
        import shlex
        import sys

        try:
            line = self.command.format(
                base_url=self.base_url,
                python=sys.executable,
                model=self.model,
                group_size=self.group_size,
                seed=self.seed + 1_000_000 * index,
                api_key=self.api_key,
            )
        except (KeyError, IndexError, ValueError) as e:
            raise ConfigError(
                explain(
                    "rollout.agent_program",
                    expected="a command line whose {placeholders} are "
                    "base_url, python, model, group_size, seed, api_key",
                    received=self.command,
                    fix=f"remove or fix the placeholder ({type(e).__name__}: {e}); write literal "
                    "braces as {{ }}",
                )
            ) from e
        return shlex.split(line)

    def start(self) -> None:
        import os
        import subprocess

        env = {
            **os.environ,
            "OPENAI_BASE_URL": self.base_url,
            "OPENAI_API_KEY": self.api_key,
            "GYMLLM_PROXY_MODEL": self.model,
        }
        for i in range(self.processes):
            argv = self.argv(i)
            log = self.run_dir / f"agent_{i}.log"
            self.logs.append(log)
            with open(log, "ab") as out:
                try:
                    self.procs.append(
                        subprocess.Popen(
                            argv,
                            stdin=subprocess.DEVNULL,
                            stdout=out,
                            stderr=subprocess.STDOUT,
                            env=env,
                            start_new_session=True,
                        )
                    )
                except OSError as e:
                    self.stop()
                    raise AgentProgramError(
                        explain(
                            "rollout.agent_program",
                            expected="a program that starts",
                            received=f"{argv}: {e}",
                            fix="check the command line",
                        )
                    ) from e

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def exit_codes(self) -> list[int | None]:
        return [p.returncode for p in self.procs]

    def tail(self, index: int, lines: int = 15) -> str:
        try:
            text = self.logs[index].read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(text[-lines:])

    async def watch(self, source: Any) -> None:
        t0 = time.monotonic()
        while True:
            codes = [p.poll() for p in self.procs]
            for i, rc in enumerate(codes):
                if rc not in (None, 0):
                    self.error = explain(
                        f"agent program {i} (pid {self.procs[i].pid})",
                        expected="it keeps playing episodes until the run stops it",
                        received=f"exit status {rc}; the end of {self.logs[i]}:\n{self.tail(i)}",
                        fix="fix the program (run the command "
                        "by hand against `gymllm serve --training`)",
                    )
            if (
                self.error is None
                and not source.counts["sessions"]
                and time.monotonic() - t0 > self.start_timeout_s
            ):
                self.error = explain(
                    "agent program",
                    expected=f"a closed session (a reward posted to {self.base_url}"
                    f"/sessions/ID/reward) within rollout.agent_start_timeout_s "
                    f"({self.start_timeout_s} s)",
                    received=f"none; the end of {self.logs[0]}:\n{self.tail(0)}",
                    fix="check that the program uses the base URL and posts "
                    "rewards, or raise agent_start_timeout_s",
                )
            if self.error is not None or all(rc == 0 for rc in codes):
                source.close()  # the trainer's wait ends: drained groups, then QueueClosed
                return
            await asyncio.sleep(self.poll_s)

    def raise_error(self) -> None:
        if self.error is not None:
            raise AgentProgramError(self.error)

    def stop(self) -> None:
        import os
        import signal
        import subprocess

        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for p in self.procs:
            try:
                p.wait(timeout=self.grace_s)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait(timeout=30)


class AgentProgramSource:
    """The proxy-mode :class:`~gymllm.rollout.sources.GroupSource` (see the module docstring): the engine
    served in training mode, ``processes`` copies of the agent program ``command`` talking to it, and
    the :class:`~gymllm.rollout.proxy_source.ProxyGroupSource` their closed sessions fill.
    ``group_filter`` (e.g. drop zero-variance groups) decides each group as it is taken."""

    name = "agent programs"
    waiting_for = "waiting for the agent program's next complete group"

    def __init__(
        self,
        engine: Any,
        tokenizer: Any,
        *,
        command: str,
        run_dir: pathlib.Path,
        config: ProxySourceConfig,
        processes: int = 1,
        seed: int = 0,
        start_timeout_s: float = 300.0,
        group_filter: Callable[[Group], bool] | None = None,
    ):
        self.engine, self.tokenizer, self.group_filter = engine, tokenizer, group_filter
        self.queue = ProxyGroupSource(config)
        self.command, self.run_dir, self.processes, self.seed = command, run_dir, processes, seed
        self.start_timeout_s = start_timeout_s
        self.server: Any = None
        self.programs: AgentPrograms | None = None
        self.url: str | None = None
        self._monitor: asyncio.Task | None = None

    async def start(self) -> "AgentProgramSource":
        from gymllm.inference.session_recorder import SessionRecorder
        from gymllm.inference.server import ServerThread, build_app

        if self.server is not None:
            return self
        recorder = SessionRecorder(self.tokenizer, on_closed=self.queue.add)
        app = build_app(
            self.engine,
            self.tokenizer,
            "policy",
            recorder=recorder,
            admission=self.queue.wait_for_room,
        )
        self.server = ServerThread(app).start()
        self.url = self.server.url
        self.programs = AgentPrograms(
            self.command,
            base_url=self.url + "/v1",
            run_dir=self.run_dir,
            processes=self.processes,
            group_size=self.queue.config.group_size,
            seed=self.seed,
            start_timeout_s=self.start_timeout_s,
        )
        self.programs.start()
        self._monitor = asyncio.create_task(self.programs.watch(self.queue))
        return self

    async def next_groups(self) -> list[Group]:
        """The next complete groups the filter keeps; :class:`AgentProgramError` when a program failed,
        ``QueueClosed`` when every program exited cleanly and the queue is drained."""
        if self.server is None:
            await self.start()
        while True:
            try:
                batch = await self.queue.next_groups()
            except QueueClosed:
                assert self.programs is not None
                self.programs.raise_error()
                raise QueueClosed(
                    f"the agent program(s) exited (status 0) after {self.queue.counts['sessions']} "
                    "closed sessions"
                ) from None
            kept = [g for g in batch if self.group_filter is None or self.group_filter(g)]
            if kept:
                return kept

    def set_policy_version(self, version: int) -> None:
        self.queue.set_policy_version(version)

    def stats(self) -> dict[str, Any]:
        return self.queue.stats()

    def result(self) -> dict[str, Any]:
        programs = self.programs
        return {
            **self.queue.stats(),
            "agent_exit_codes": programs.exit_codes() if programs else [],
            "agent_pids": programs.pids if programs else [],
            "proxy_url": self.url,
            "rollout_errors": [],
        }

    async def close(self) -> None:
        """Stop the monitor, close the queue (held-back sessions get 503), stop the programs and the server."""
        if self._monitor is not None:
            self._monitor.cancel()
        self.queue.close()
        if self.programs is not None:
            self.programs.stop()
        if self.server is not None:
            self.server.stop()
