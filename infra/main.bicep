// Scheduled Events Bridge: everything in Azure except the VMs.
// Deploy at resource-group scope (README, Deploy). Installing the forwarder on existing VMs and
// scale sets is a separate deployment: infra/forwarder.bicep.

targetScope = 'resourceGroup'

@description('Azure region for every resource (Flex Consumption must be available there).')
param location string = resourceGroup().location

@description('Short name of the environment, part of every resource name: lowercase letters and digits (e.g. prod, test).')
@minLength(1)
@maxLength(8)
param environmentName string

@description('Service Bus tier.')
@allowed([
  'Standard'
  'Premium'
])
param serviceBusSku string = 'Standard'

@description('Messaging units when serviceBusSku is Premium.')
@allowed([
  1
  2
  4
  8
  16
])
param serviceBusPremiumCapacity int = 1

@description('Duplicate detection window of the scheduled-events topic (ISO 8601 duration).')
param topicDuplicateDetectionWindow string = 'P1D'

@description('Resource groups (in this subscription) whose VMs the bridge manages: lb-pools may change their load balancer pools, the gate may acknowledge their events. The app gets Network Contributor and Scheduled Events Contributor on each of them and on nothing else, so list also the groups holding the load balancers and virtual networks those VMs\' NICs use.')
param lbManagedResourceGroups array = []

@description('Event types for which lb-pools takes VMs out of their pools.')
param lbImpactfulEventTypes string = 'Reboot,Redeploy,Preempt,Terminate'

@description('A Freeze at most this long (seconds) leaves the VM in its pools.')
@minValue(0)
param lbFreezeThresholdSeconds int = 9

@description('Approval policy JSON (APPROVAL_POLICY); empty uses the documented default.')
param approvalPolicy string = ''

@description('Use the ARM acknowledge API when the observing forwarder is silent.')
param acknowledgeFallbackEnabled bool = false

@description('A forwarder without a Heartbeat for this long (seconds) counts as silent.')
@minValue(60)
param heartbeatStaleSeconds int = 900

@description('Enable your own subscriber function (CUSTOM_SUBSCRIBER_ENABLED).')
param customSubscriberEnabled bool = false

@description('Subscription your own subscriber function reads (CustomSubscriptionName): its own, not one of teams, lb-pools, approval-gate, audit. Add it to infra/servicebus-emulator/Config.json first: that file defines every entity, here and in the emulator.')
param customSubscriptionName string = ''

@description('Upper bound of Function App instances.')
@minValue(1)
@maxValue(1000)
param functionMaximumInstanceCount int = 40

@description('Object id of the user or group that sets the Key Vault secrets after deployment (gets Key Vault Secrets Officer on the vault). Empty: grant it yourself.')
param secretsOfficerPrincipalId string = ''

@description('Days Log Analytics keeps data.')
@minValue(30)
@maxValue(730)
param logRetentionInDays int = 30

@description('Tags for every resource.')
param tags object = {}

var abbrs = loadJsonContent('abbreviations.json')
// Stable per resource group and environment, so redeployments update rather than duplicate.
var resourceToken = toLower(uniqueString(subscription().id, resourceGroup().id, environmentName))
var allTags = union(tags, {
  'sebridge-environment': environmentName
})

// The subscriptions the Function App's triggers bind to (its Data Receiver scopes). The audit
// subscription has no function: it is drained by whoever audits, with their own grant. Your own
// subscriber's subscription joins the list only while it is enabled.
var teamsSubscriptionName = 'teams'
var lbPoolsSubscriptionName = 'lb-pools'
var approvalGateSubscriptionName = 'approval-gate'
var builtInSubscriptionNames = [
  teamsSubscriptionName
  lbPoolsSubscriptionName
  approvalGateSubscriptionName
]
var customSubscriptionNames = (customSubscriberEnabled && !empty(customSubscriptionName)) ? [
  customSubscriptionName
] : []
var functionAppSubscriptionNames = concat(builtInSubscriptionNames, customSubscriptionNames)

var teamsWebhookSecretName = 'teams-webhook-url'
var approvalSigningKeySecretName = 'approval-signing-key'

module serviceBus 'modules/servicebus.bicep' = {
  name: 'servicebus'
  params: {
    location: location
    namespaceName: '${abbrs.serviceBusNamespace}${environmentName}-${resourceToken}'
    skuName: serviceBusSku
    premiumCapacity: serviceBusPremiumCapacity
    topicDuplicateDetectionWindow: topicDuplicateDetectionWindow
    tags: allTags
  }
}

module monitoring 'modules/monitoring.bicep' = {
  name: 'monitoring'
  params: {
    location: location
    workspaceName: '${abbrs.logAnalyticsWorkspace}${environmentName}-${resourceToken}'
    appInsightsName: '${abbrs.appInsights}${environmentName}-${resourceToken}'
    retentionInDays: logRetentionInDays
    tags: allTags
  }
}

module storage 'modules/storage.bicep' = {
  name: 'storage'
  params: {
    location: location
    name: take('${abbrs.storageAccount}${toLower(environmentName)}${resourceToken}', 24)
    deploymentContainerName: 'app-package'
    heartbeatContainerName: 'sebridge-heartbeats'
    poolStateContainerName: 'sebridge-pools'
    tags: allTags
  }
}

module keyVault 'modules/keyvault.bicep' = {
  name: 'keyvault'
  params: {
    location: location
    name: take('${abbrs.keyVault}${environmentName}-${resourceToken}', 24)
    secretsOfficerPrincipalId: secretsOfficerPrincipalId
    tags: allTags
  }
}

module forwarderIdentity 'modules/identity.bicep' = {
  name: 'forwarder-identity'
  params: {
    location: location
    name: '${abbrs.managedIdentity}sebridge-forwarder-${environmentName}'
    tags: allTags
  }
}

module functionApp 'modules/functionapp.bicep' = {
  name: 'functionapp'
  params: {
    location: location
    name: '${abbrs.functionApp}sebridge-${environmentName}-${resourceToken}'
    planName: '${abbrs.functionPlan}sebridge-${environmentName}-${resourceToken}'
    tags: allTags
    storageAccountName: storage.outputs.name
    deploymentContainerUrl: storage.outputs.deploymentContainerUrl
    appInsightsConnectionString: monitoring.outputs.connectionString
    serviceBusFullyQualifiedNamespace: serviceBus.outputs.fullyQualifiedNamespace
    topicName: serviceBus.outputs.topicName
    teamsSubscriptionName: teamsSubscriptionName
    lbPoolsSubscriptionName: lbPoolsSubscriptionName
    approvalGateSubscriptionName: approvalGateSubscriptionName
    approvalsQueueName: serviceBus.outputs.approvalsQueueName
    keyVaultUri: keyVault.outputs.vaultUri
    teamsWebhookSecretName: teamsWebhookSecretName
    approvalSigningKeySecretName: approvalSigningKeySecretName
    approvalPolicy: approvalPolicy
    lbImpactfulEventTypes: lbImpactfulEventTypes
    lbFreezeThresholdSeconds: lbFreezeThresholdSeconds
    lbManagedResourceGroups: lbManagedResourceGroups
    acknowledgeFallbackEnabled: acknowledgeFallbackEnabled
    heartbeatStaleSeconds: heartbeatStaleSeconds
    customSubscriberEnabled: customSubscriberEnabled
    customSubscriptionName: customSubscriptionName
    heartbeatStoreUrl: storage.outputs.heartbeatContainerUrl
    maximumInstanceCount: functionMaximumInstanceCount
  }
}

module functionAppRoles 'modules/functionapp-roles.bicep' = {
  name: 'functionapp-roles'
  params: {
    functionAppPrincipalId: functionApp.outputs.principalId
    storageAccountName: storage.outputs.name
    keyVaultName: keyVault.outputs.name
    appInsightsName: monitoring.outputs.appInsightsName
  }
}

module serviceBusRoles 'modules/servicebus-roles.bicep' = {
  name: 'servicebus-roles'
  params: {
    namespaceName: serviceBus.outputs.namespaceName
    topicName: serviceBus.outputs.topicName
    approvalsQueueName: serviceBus.outputs.approvalsQueueName
    functionAppPrincipalId: functionApp.outputs.principalId
    functionAppSubscriptionNames: functionAppSubscriptionNames
    forwarderPrincipalId: forwarderIdentity.outputs.principalId
  }
}

// One deployment per managed resource group, so the grants' scope is that group only. (Its
// name is cut to fit the 64 characters of a deployment name: group names run to 90.)
module poolRoles 'modules/managed-group-roles.bicep' = [for rg in lbManagedResourceGroups: {
  name: '${take('managed-group-roles-${rg}', 50)}-${uniqueString(rg)}'
  scope: resourceGroup(rg)
  params: {
    functionAppPrincipalId: functionApp.outputs.principalId
  }
}]

@description('Fully qualified Service Bus namespace (SEBRIDGE_NAMESPACE on the VMs).')
output serviceBusNamespace string = serviceBus.outputs.fullyQualifiedNamespace

@description('Name of the scheduled-events topic.')
output topicName string = serviceBus.outputs.topicName

@description('Name of the approvals queue.')
output approvalsQueueName string = serviceBus.outputs.approvalsQueueName

@description('Name of the Function App (deploy the code to it).')
output functionAppName string = functionApp.outputs.name

@description('Public base URL of the Function App (Approve links).')
output functionAppUrl string = 'https://${functionApp.outputs.defaultHostName}'

@description('Name of the Key Vault that holds the app\'s secrets.')
output keyVaultName string = keyVault.outputs.name

@description('Secret names to set after deployment (az keyvault secret set).')
output keyVaultSecretNames object = {
  teamsWebhookUrl: teamsWebhookSecretName
  approvalSigningKey: approvalSigningKeySecretName
}

@description('Client id of the forwarders\' identity (AZURE_CLIENT_ID on the VMs).')
output forwarderIdentityClientId string = forwarderIdentity.outputs.clientId

@description('Resource id of the forwarders\' identity (attach it to VMs and scale sets).')
output forwarderIdentityResourceId string = forwarderIdentity.outputs.id

@description('Principal id of the forwarders\' identity.')
output forwarderIdentityPrincipalId string = forwarderIdentity.outputs.principalId

@description('Principal id of the Function App\'s system-assigned identity.')
output functionAppPrincipalId string = functionApp.outputs.principalId
