"""The evaluation matrix (REFERENCE section 10): evaluation set, models, generation, scoring, aggregates."""
