// SPDX-License-Identifier: Apache-2.0
// `jsonnet -S rules.jsonnet`: the Prometheus rule file (make mixin writes deploy/prometheus/mergewatch.rules.yml).
local mixin = import 'mixin.libsonnet';

|||
  # SPDX-License-Identifier: Apache-2.0
  # Prometheus rules for mergewatchd. GENERATED from deploy/mixin/ by `make mixin`: edit the mixin, not this file
  # (the job selector and the runbook URL are set in deploy/mixin/config.libsonnet).
  # Load with `rule_files: [mergewatch.rules.yml]`. Checked by `promtool check rules` and unit-tested by
  # `promtool test rules` (tests/deploy/rules.test.yml).
  #
  # Job selector: %(mergewatchSelector)s. Runbook: %(runbookURL)s.
||| % mixin._config
+ std.manifestYamlDoc({ groups: mixin.prometheusRules.groups + mixin.prometheusAlerts.groups },
                      indent_array_in_object=true,
                      quote_keys=false)
+ '\n'
