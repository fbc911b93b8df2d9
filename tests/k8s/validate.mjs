// Reads a JSON array of Kubernetes objects on stdin and validates each Prometheus Operator object
// (ServiceMonitor, PrometheusRule) against the schema @kubernetes-models/prometheus-operator
// generates from the operator's CRDs. Prints one JSON line per object; exits 1 on any error.
import { ServiceMonitor } from "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/ServiceMonitor";
import { PrometheusRule } from "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/PrometheusRule";

const models = { ServiceMonitor, PrometheusRule };
let input = "";
for await (const chunk of process.stdin) input += chunk;
let failed = false;
for (const object of JSON.parse(input)) {
  const Model = models[object.kind];
  if (!Model) {
    console.log(JSON.stringify({ kind: object.kind, error: "no schema for this kind" }));
    failed = true;
    continue;
  }
  try {
    new Model(object).validate();
    console.log(JSON.stringify({ kind: object.kind, name: object.metadata?.name, valid: true }));
  } catch (error) {
    console.log(JSON.stringify({ kind: object.kind, name: object.metadata?.name, error: String(error.message ?? error) }));
    failed = true;
  }
}
process.exit(failed ? 1 : 0);
