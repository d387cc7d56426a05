"""The suite's plumbing that no chapter imports: case outcomes and known failures, the crash search, the
rule-coverage table, the pre-lowering, the toolchain preflight, the matrix cells, the case seconds."""
