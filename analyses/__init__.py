"""What we compute about a trained model: circuits, composition, induction, ablation (learned
accuracy), probes (separation accuracy), attention ratios. Depends on ``interp`` and, only through the
task protocol, on ``tasks``."""
