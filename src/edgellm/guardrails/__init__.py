"""Guardrails: data-loss prevention (`dlp`), moderation verdicts (`moderation`) and the policy
that says what each finding or hazard category means (`policy`). Pure functions of the core."""
