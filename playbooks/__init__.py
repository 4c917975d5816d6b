"""The seven-step triage order and scenario playbooks as data, and their evaluator."""
