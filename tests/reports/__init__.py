"""Self-tests of ``reports/``: the dashboard (in a browser too), the HTML summary, comparisons, side by side
pages and the rule coverage page."""
