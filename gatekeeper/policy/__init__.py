"""Policy: the policy file's model and loader, and the path patterns it is written in.

First stage of the pipeline. Imports only the helpers at the bottom (`errors`, `git`).
Kept free of imports itself: the supervisor loads `patterns` and must start fast.
"""
