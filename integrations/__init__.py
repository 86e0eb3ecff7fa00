"""pvpo.integrations: our search environment, rewards and PVPO's static anchor and Group Sampling
inside the trainers people already use.

- `pvpo.integrations.trl`: a `GRPOTrainer(environment_factory=...)` environment (tool calling:
  `search` and `answer` tools over our episode rules, retriever client and rewards), the TRL
  dataset of our questions, and `PVPOGRPOTrainer`, whose advantages are PVPO's `r - anchor[uid]`.
- `pvpo.integrations.verl`: an agent loop (tag protocol, token-in/token-out), a native search
  tool for verl's tool agent loop, a reward function for `custom_reward_function`, the `pvpo`
  advantage estimator (registered through verl's plugin entry point) and verl's parquet rows.
- `pvpo.integrations.reference`: the anchor and Group Sampling files those adapters read.

Importing this package imports neither trl nor verl; each adapter imports its framework when it
is itself imported (install them with `pip install 'pvpo-search[trl]'` or `'pvpo-search[verl]'`).
"""
