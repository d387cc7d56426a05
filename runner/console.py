"""What a run needs of the tool that started it: lines of output, and commands run the way it runs them.

``noxfile.py`` adapts nox's session to this; the self-tests pass a fake that records the calls. The
commands are argument lists (the interpreter first); each method says what a failure does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import NoReturn, Protocol


class Started(Protocol):
    """A command started in the background (``subprocess.Popen`` is one)."""

    pid: int

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...

    def send_signal(self, sig: int) -> None: ...

    def kill(self) -> None: ...


class Console(Protocol):
    def log(self, message: str) -> None:
        """A line of the run's own output."""
        ...

    def warn(self, message: str) -> None:
        """A line that says something went wrong but the run goes on."""
        ...

    def error(self, message: str) -> NoReturn:
        """End the session as failed, saying why (raises)."""
        ...

    def run(self, cmd: Sequence[str], *, success_codes: Sequence[int] = (0,)) -> None:
        """Run a step, its command line shown; an exit code outside ``success_codes`` fails the session
        (raises the tool's own exception)."""
        ...

    def output(self, cmd: Sequence[str]) -> str:
        """Run a query quietly (no command line shown) and return its output; a failure fails the session."""
        ...

    def exit_code(
        self,
        cmd: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        interrupt_s: float | None = None,
        terminate_s: float | None = None,
    ) -> int:
        """Run a command, its command line shown, with ``env`` added to the environment, and return its exit
        code: a failure is the caller's to judge. When the front door is stopped (a ``KeyboardInterrupt``
        in this process), the command is interrupted, given ``interrupt_s`` then ``terminate_s`` seconds to
        end (the tool's defaults where None), and the ``KeyboardInterrupt`` propagates."""
        ...

    def start(self, cmd: Sequence[str], *, env: Mapping[str, str], output: Path) -> Started:
        """Start a command in the background, its command line shown, with ``env`` added to the environment
        and its output (stdout and stderr) written to ``output``; the caller waits for it and stops it."""
        ...

    def echo(self, text: str) -> None:
        """Show a command's output as it is (no prefix), as the tool shows the commands it runs."""
        ...
