// Parameters for infra/main.bicep. Copy per environment (e.g. main.prod.bicepparam) and pass
// with `az deployment group create --parameters <file>`. Nothing secret belongs here: the Key
// Vault secrets are set after deployment (README, Deploy).
using './main.bicep'

param environmentName = 'prod'
param serviceBusSku = 'Standard'
param topicDuplicateDetectionWindow = 'P1D'

// Resource groups whose load balancer pools the lb-pools workflow may change.
param lbManagedResourceGroups = [
  'rg-web-prod'
]
param lbImpactfulEventTypes = 'Reboot,Redeploy,Preempt,Terminate'
param lbFreezeThresholdSeconds = 9

param acknowledgeFallbackEnabled = false
param heartbeatStaleSeconds = 900
param customSubscriberEnabled = false

// Object id of whoever sets the Key Vault secrets (az ad signed-in-user show --query id -o tsv).
param secretsOfficerPrincipalId = ''

param tags = {
  workload: 'scheduled-events-bridge'
}
