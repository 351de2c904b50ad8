"""The schedule: which packed rows each data-parallel rank trains at each step (pure numpy).

- :mod:`packer.schedule.balance` -- one scalar cost per row: the greedy split of a step over the ranks, the
  windowed grouping of rows into steps, the token-only plan :class:`~packer.loader.TokenBalancedSampler` follows
  (:func:`~packer.schedule.balance.token_balanced`), and the imbalance measures the report shows.
- :mod:`packer.schedule.steps` -- the step plan balanced on every cost a row has at once (``packer steps``,
  :class:`~packer.loader.StepPlanSampler`), mixture stages, and its measures.
- :mod:`packer.schedule.grouping` -- which rows share a step of that plan: the k-d split, swaps between
  neighbouring steps, and regrouping neighbourhoods of steps toward the plan's worst cost.
"""
