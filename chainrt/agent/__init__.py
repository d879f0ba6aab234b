"""Agent steps: their budget rules, tools, model turns and approvals (pure decisions and the
tools' loading; the loop that drives them is ``chainrt._run._agent``)."""
