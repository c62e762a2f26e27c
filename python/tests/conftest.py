"""Shared fixtures: every test gets its own root in a temporary folder."""

from __future__ import annotations

import subprocess
import sys

import pytest

import session_store


@pytest.fixture
def root(tmp_path) -> session_store.Root:
    return session_store.Root(tmp_path / "root")


def turn(turn_id: str, *messages: dict) -> list[dict]:
    """The events of one completed turn holding ``messages``."""
    return [
        {"kind": "turn/start"},
        *({"kind": "message/complete", "payload": {"message": m}} for m in messages),
        {"kind": "turn/end", "payload": {"status": "completed"}},
    ]


def lose_the_create_race(monkeypatch) -> None:
    """Makes the next ``Root.open`` find no session while another process (played by the
    same root) creates it just after: the caller's ``create`` then meets it."""
    real_open = session_store.Root.open

    def open_as_the_race_is_lost(self, session_id):
        monkeypatch.setattr(session_store.Root, "open", real_open)
        self.create(session_id).close()
        raise session_store.NotFound(f"session {session_id} not found")

    monkeypatch.setattr(session_store.Root, "open", open_as_the_race_is_lost)


def msg(i: int, role: str = "user", content: str | None = None) -> dict:
    return {"id": f"m{i}", "role": role, "content": content or f"message {i}"}


def run_script(script: str, *args, timeout: float = 120) -> subprocess.CompletedProcess:
    """Runs the Python source ``script`` in a new interpreter with ``args`` (as strings) as
    its ``sys.argv[1:]``; asserts it exited with 0 (its stderr as the message)."""
    done = subprocess.run(
        [sys.executable, "-c", script, *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stderr
    return done


# The end of a script (for ``run_script``) testing what a child made by ``os.fork()`` can
# do with what its parent holds: the script defines ``before(out)`` (the child's tries while
# the parent still holds it), ``release()`` (the parent lets it go) and ``after(out)`` (the
# child's tries then); the child prints ``out`` as JSON and the script exits with the
# child's status.
FORK_HANDSHAKE = r"""
go_on, told = os.pipe()
tried, tell = os.pipe()
pid = os.fork()
if pid == 0:
    signal.alarm(60)
    out = {}
    before(out)
    os.write(tell, b"x")
    os.read(go_on, 1)  # the parent has let it go
    after(out)
    print(json.dumps(out), flush=True)
    os._exit(0)
os.read(tried, 1)  # the child has tried while this process held it
release()
os.write(told, b"x")
_, status = os.waitpid(pid, 0)
sys.exit(status)
"""
