// SPDX-License-Identifier: Apache-2.0
// mergewatch monitoring mixin (https://monitoring.mixins.dev/ conventions): prometheusAlerts,
// prometheusRules, grafanaDashboards. Site settings are in config.libsonnet (_config).
(import 'config.libsonnet')
+ (import 'alerts.libsonnet')
+ (import 'rules.libsonnet')
+ (import 'dashboards.libsonnet')
+ (import 'findings.libsonnet')
+ (import 'cohorts.libsonnet')
