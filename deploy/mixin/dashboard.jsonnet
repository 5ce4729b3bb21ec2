// SPDX-License-Identifier: Apache-2.0
// `jsonnet dashboard.jsonnet`: the Grafana dashboard (make mixin writes deploy/grafana/mergewatch.json).
(import 'mixin.libsonnet').grafanaDashboards['mergewatch.json']
