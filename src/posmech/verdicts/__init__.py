"""The verdict layer: findings (does a claim hold on a model), the published-value scorecard, the self-check, the training dynamics and the head-roles table."""
