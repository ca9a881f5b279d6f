"""`mlx-rlaif serve-reward FILE.py:fn`: serve a reward function over HTTP with the protocol of
the `server` reward component (and OpenRLHF's), so a reward model can run on another machine.

The function is loaded and its signature checked before the server starts (one line, exit 2,
when it cannot be). It binds 127.0.0.1 unless `--host` says otherwise, prints the URL it
serves on (with `--port 0`, the port the system picked), and runs until Ctrl-C.

The operator's `--kwarg` are fixed: a request may set only the keys `--request-kwarg` names
(none of the operator's), and nothing in a request chooses a function's default (a model, a
path). With a token (`--token`, or MLX_RLAIF_REWARD_TOKEN in the environment) every request
must carry it (`Authorization: Bearer`, which the client sends from the same variable); it is
never printed. Host, Origin and Content-Type are checked (rewards/custom/server.py). Once it
serves, what the function prints (stdout, stderr, from Python or C) reaches the terminal only
as `[FILE.py:fn] text` lines on stderr, control characters escaped (rewards/custom/relay.py),
and the server's own error lines are written whole, one at a time.

Not covered: TLS (put it behind your own proxy for another network).
"""

from __future__ import annotations

import argparse
import os

from ..errors import UsageError

HELP = "Serve a reward function (FILE.py:fn or pkg.mod:fn) over HTTP for a server component."


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("function", metavar="FILE.py:fn", help="the reward function to serve")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8400, help="port (0: any free one; default 8400)")
    p.add_argument("--kwarg", action="append", default=[], metavar="KEY=VALUE",
                   help="keyword argument for the function, the value read as YAML (repeatable)")
    p.add_argument("--concurrency", type=int, default=8,
                   help="async def functions: calls in flight at once (default 8)")
    p.add_argument("--request-kwarg", action="append", default=[], metavar="KEY",
                   help="a keyword argument a request may set (repeatable; default: none; "
                   "never one --kwarg sets)")
    p.add_argument("--token", default=None,
                   help="require this shared token of every request (default: "
                   "$MLX_RLAIF_REWARD_TOKEN if set; prefer the variable: a flag shows in ps)")


def kwargs_of(items: list[str]) -> dict:
    import yaml

    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"--kwarg {item!r}: write KEY=VALUE, e.g. --kwarg model=builtin:tiny-coder")
        out[key] = yaml.safe_load(value) if value else ""
    return out


def run(args: argparse.Namespace) -> int:
    from ..rewards.custom.client import TOKEN_ENV
    from ..rewards.custom.relay import capture_fds, write_line
    from ..rewards.custom.server import make_server
    from ..rewards.custom.spec import load_function

    kwargs = kwargs_of(args.kwarg)
    fn = load_function(args.function, kwargs, None)
    token = args.token or os.environ.get(TOKEN_ENV) or None
    try:
        server = make_server(fn, args.host, args.port, kwargs, args.concurrency, token=token,
                             request_kwargs=args.request_kwarg)
    except ValueError as e:
        raise UsageError(str(e)) from None
    except OSError as e:
        raise UsageError(f"cannot serve on {args.host}:{args.port} ({e.strerror or e}): pick "
                         "another --port") from None
    host, port = server.server_address[:2]
    print(f"serving {args.function} on http://{host}:{port}/ (POST JSON, docs/rewards.md"
          f"{'; a token is required' if token else ''}); Ctrl-C stops", flush=True)
    server.out = capture_fds(args.function)  # the function's prints: [spec] lines, sanitized
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    write_line("stopped", server.out)
    return 0
