"""The reference inference engine that perfdiag's probes record and its playbooks diagnose."""
