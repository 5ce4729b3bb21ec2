# Reliability: sanitizers, fuzzing, churn (filled in by the reliability work).
