"""The CLI's verbs: one module per verb, each a function of keyword arguments that returns an
exit code. The top of the pipeline: may import any package below it, and none imports it
(the hook scripts enter through `gatekeeper.hookrun`)."""
