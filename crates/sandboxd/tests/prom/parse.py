"""Parses a /metrics scrape (stdin) with the official Python client's parser and prints its
samples as JSON lines: {"name", "labels", "value"}. argv[1] is "prometheus" (text format
0.0.4) or "openmetrics"; a scrape the parser rejects exits non-zero with its error."""
import json
import sys

fmt = sys.argv[1]
text = sys.stdin.read()
if fmt == "openmetrics":
    from prometheus_client.openmetrics.parser import text_string_to_metric_families
else:
    from prometheus_client.parser import text_string_to_metric_families

families = 0
for family in text_string_to_metric_families(text):
    families += 1
    if not family.documentation:
        sys.exit(f"family {family.name} has no HELP text")
    for s in family.samples:
        print(json.dumps({"name": s.name, "labels": s.labels, "value": s.value, "type": family.type}))
if families == 0:
    sys.exit("no metric family in the scrape")
