"""The vocabulary every layer above the protocol shares: the immutable cluster snapshot a
policy decides on and the plan it returns (:mod:`hpcsched.model.snapshot`). Imports only
:mod:`hpcsched.protocol` (``docs/architecture.md``)."""
