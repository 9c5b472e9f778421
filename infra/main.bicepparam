// Parameters for infra/main.bicep. Copy per environment (e.g. main.prod.bicepparam) and pass
// with `az deployment group create --parameters <file>`. Nothing secret belongs here: the Key
// Vault secrets are set after deployment (docs/deploy.md).
using './main.bicep'

param environmentName = 'prod'
param serviceBusSku = 'Standard'
param topicDuplicateDetectionWindow = 'P1D'

// Resource groups whose VMs the bridge manages: lb-pools may change their load balancer pools,
// the approval gate may acknowledge their events (docs/deploy.md: lbManagedResourceGroups).
// Each must exist before the deployment (it holds your VMs; the Deploy steps check it).
param lbManagedResourceGroups = [
  'rg-web-prod'
]
param lbImpactfulEventTypes = 'Reboot,Redeploy,Preempt,Terminate'
param lbFreezeThresholdSeconds = 9

param acknowledgeFallbackEnabled = false
param heartbeatStaleSeconds = 900
// Your own subscriber: add its subscription to infra/servicebus-emulator/Config.json first,
// then set customSubscriberEnabled = true and customSubscriptionName = '<its name>'.
param customSubscriberEnabled = false

// Teams cards (docs/workflows.md: setting up Teams). false for a Slack- or PagerDuty-only setup: then list at
// least one endpoint below, or the app refuses to start (it needs one notifier).
param teamsEnabled = true

// Notifications beyond Teams (docs/workflows.md: Webhooks). No secret here: urlSetting and
// routingKeySetting name app settings, and each one listed in webhookSecretSettings becomes a
// Key Vault reference to the secret of that name in lower case with dashes, set after deployment.
param webhookEndpoints = [
  // { name: 'ops-slack', preset: 'slack', urlSetting: 'WEBHOOK_OPS_SLACK_URL' }
  // { name: 'oncall', preset: 'pagerduty', routingKeySetting: 'WEBHOOK_ONCALL_ROUTING_KEY' }
]
param webhookSecretSettings = [
  // 'WEBHOOK_OPS_SLACK_URL'
  // 'WEBHOOK_ONCALL_ROUTING_KEY'
]

// Alert rules: dead-lettered messages and forwarders whose Heartbeat stopped (docs/monitoring.md: Telemetry).
param alertsEnabled = false
param alertActionGroupIds = []

// Who may send approve commands by hand (sebridge approve): object ids of users, groups or
// service principals; each gets Azure Service Bus Data Sender on the approvals queue only.
param approvalSenderPrincipalIds = []

// Object id of whoever sets the Key Vault secrets after deployment (Key Vault Secrets Officer on
// the vault): the next step (docs/deploy.md) fails without it. Read from the environment when the
// file is compiled, so the example cannot be deployed with it left empty:
//   export SEBRIDGE_SECRETS_OFFICER_ID="$(az ad signed-in-user show --query id -o tsv)"
// Unset, the deployment stops before it starts, naming the variable. To grant the role yourself
// instead, write an empty string here.
param secretsOfficerPrincipalId = readEnvironmentVariable('SEBRIDGE_SECRETS_OFFICER_ID')

param tags = {
  workload: 'scheduled-events-bridge'
}
