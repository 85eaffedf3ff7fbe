"""Sandbox: the boundary a run's commands execute in.

`mounts` turns a policy into a bubblewrap mount plan; `launch` starts bubblewrap with the
seccomp filter (`seccomp`), resource limits (`limits`) and the secret names it hides
(`secrets`). `supervise/` watches every process of the tree through seccomp user
notifications; `net/` is the only way out to a network, the launcher's proxy.

May import `policy`, `receipt` (the record's models) and the helpers; never `run`, `gate`,
`report` or the CLI. Kept free of imports itself: the supervisor starts for every command.
"""
