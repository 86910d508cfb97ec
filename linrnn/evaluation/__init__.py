"""Is a cell any good: ``linrnn eval mqar`` (associative recall), ``linrnn eval length`` (loss by token position),
and the lm-eval-harness model ``linrnn`` (``linrnn.evaluation.harness``)."""
