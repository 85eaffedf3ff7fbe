"""Policy: the policy file's model and loader, and the path patterns it is written in.

First stage of the pipeline. Imports only the helpers at the bottom (`errors`, `git`).
Kept free of imports itself: the supervisor loads `patterns` and must start fast.
"""

# Where a repository keeps its policy and its trust file (here, not in `model`, so that a
# check can start reading them before the models load).
POLICY_PATH = ".gatekeeper/policy.yaml"
TRUST_PATH = ".gatekeeper/trusted_keys"
