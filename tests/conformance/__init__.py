"""Self-tests of the suite (``conformance/``): its chapters against broken backends, the rule table, the
catalogue, rule coverage, the model zoo, optional parts and the gates."""
