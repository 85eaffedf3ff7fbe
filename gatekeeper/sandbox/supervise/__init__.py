"""The syscall supervisor: seccomp user notifications for every process of a run.

Kept free of heavy imports: it starts for every sandboxed command.
"""
