// Scheduled Events Bridge: everything in Azure except the VMs.
// Deploy at resource-group scope (docs/deploy.md). Installing the forwarder on existing VMs and
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

@description('A Freeze shorter than this (seconds) leaves the VM in its pools; one at least this long, or of unknown length, drains.')
@minValue(0)
param lbFreezeThresholdSeconds int = 9

@description('Fewest healthy members lb-pools leaves in a backend pool (LB_MIN_HEALTHY); 0 turns the capacity guard off.')
@minValue(0)
@maxValue(1000)
param lbMinHealthy int = 1

@description('Most members of a backend pool that may be out at once (LB_MAX_UNAVAILABLE): a count (2) or a percentage of the pool (25%); empty: no maximum, LB_MIN_HEALTHY alone.')
param lbMaxUnavailable string = ''

@description('Disruption budgets per pool (LB_POOL_BUDGETS), JSON: {"lb-web/pool-a": {"minHealthy": 2, "maxUnavailable": "25%"}}; empty: the global ones for every pool.')
param lbPoolBudgets string = ''

@description('Approval policy JSON (APPROVAL_POLICY); empty uses the documented default.')
param approvalPolicy string = ''

@description('Use the ARM acknowledge API when the observing forwarder is silent.')
param acknowledgeFallbackEnabled bool = false

@description('A forwarder without a Heartbeat for this long (seconds) counts as silent.')
@minValue(60)
param heartbeatStaleSeconds int = 900

@description('Enable your own subscriber function (CUSTOM_SUBSCRIBER_ENABLED).')
param customSubscriberEnabled bool = false

@description('Subscription your own subscriber function reads (CustomSubscriptionName): its own, not one of teams, lb-pools, approval-gate, webhooks, history, audit. Add it to infra/servicebus-emulator/Config.json first: that file defines every entity, here and in the emulator.')
param customSubscriptionName string = ''

@description('Post a Teams card per transition (the teams workflow; its webhook URL is the Key Vault secret teams-webhook-url). false: a Slack- or PagerDuty-only setup: no Teams setting, secret or subscription, and webhookEndpoints must list at least one endpoint or the app refuses to start.')
param teamsEnabled bool = true

@description('Webhook endpoints of the webhooks workflow (WEBHOOKS): objects with name, preset (slack, pagerduty, generic), urlSetting, routingKeySetting, transitions, eventTypes, impactfulOnly, template. No secret here: urlSetting and routingKeySetting name app settings listed in webhookSecretSettings.')
param webhookEndpoints array = []

@description('New PagerDuty incidents one VM\'s reports may open per hour (WEBHOOK_PAGES_PER_OBSERVER_HOUR, 1-1000).')
@minValue(1)
@maxValue(1000)
param webhookPagesPerObserverHour int = 10

@description('App settings that hold the webhook secrets (URLs, PagerDuty routing keys), e.g. WEBHOOK_OPS_SLACK_URL: each becomes a Key Vault reference to the secret of the same name in lower case with dashes (webhook-ops-slack-url), which you set after deployment.')
param webhookSecretSettings array = []

@description('Deploy the alert rules: dead-lettered messages (topic and approvals queue) and forwarders whose Heartbeat stopped.')
param alertsEnabled bool = false

@description('Resource ids of the action groups the alert rules notify; empty: the alerts show in the portal only.')
param alertActionGroupIds array = []

@description('Upper bound of Function App instances.')
@minValue(1)
@maxValue(1000)
param functionMaximumInstanceCount int = 40

@description('Object ids of the users, groups or service principals who may send approve commands by hand (sebridge approve): each gets Azure Service Bus Data Sender on the approvals queue only (az ad signed-in-user show --query id -o tsv).')
param approvalSenderPrincipalIds array = []

@description('Object id of the user or group that sets the Key Vault secrets after deployment (gets Key Vault Secrets Officer on the vault). Empty: grant it yourself.')
param secretsOfficerPrincipalId string = ''

@description('Days Log Analytics keeps data.')
@minValue(30)
@maxValue(730)
param logRetentionInDays int = 30

@description('Tags for every resource.')
param tags object = {}

@description('Agentless mode (preview): run the Event Grid ingestion function (EVENTGRID_INGEST_ENABLED) and create its blob containers. Deploy the code, then deploy again with agentlessEventSubscription.')
param agentlessIngest bool = false

@description('Create the Event Grid system topic Microsoft.ResourceNotifications.MaintenanceResources (location global, source this subscription) and its event subscription to the ingestion function. Needs agentlessIngest and the function code deployed: Event Grid checks that the function exists.')
param agentlessEventSubscription bool = false

@description('Name of the system topic; empty: a name from the abbreviations. A subscription holds one system topic per topic type: if yours has one for Microsoft.ResourceNotifications.MaintenanceResources, give its name (it must be in this resource group).')
param agentlessSystemTopicName string = ''

@description('Schema Event Grid delivers the notifications in (the function reads both).')
@allowed([
  'EventGridSchema'
  'CloudEventSchemaV1_0'
])
param agentlessDeliverySchema string = 'EventGridSchema'

@description('Resource groups whose VMs run no forwarder (AGENTLESS_RESOURCE_GROUPS): the approval gate acknowledges their events through ARM. List them in lbManagedResourceGroups too, for the acknowledge permission.')
param agentlessResourceGroups array = []

@description('VM and scale-set name patterns (shell-style, e.g. batch-*) that run no forwarder (AGENTLESS_VM_PATTERNS).')
param agentlessVmPatterns array = []

@description('Existing VMs, scale sets and availability sets to opt in to scheduled events in Event Grid (scheduledEventsPolicy, Compute API 2025-04-01), one entry per resource group: {resourceGroup, vmNames, vmssNames, availabilitySetNames}. Register the preview features first (docs/agentless.md).')
param scheduledEventsPolicyTargets array = []

@description('Deploy the fleet maintenance workbook (Azure Monitor) over the history\'s summary lines in Application Insights.')
param workbookEnabled bool = true

@description('Days an event stays in the history after its last entry (HISTORY_RETENTION_DAYS, 1-3650).')
@minValue(1)
@maxValue(3650)
param historyRetentionDays int = 90

@description('Days before and after now that the maintenance calendar feed covers (CALENDAR_WINDOW_DAYS, 1-366).')
@minValue(1)
@maxValue(366)
param calendarWindowDays int = 30

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
var webhooksSubscriptionName = 'webhooks'
var historySubscriptionName = 'history'
var builtInSubscriptionNames = [
  lbPoolsSubscriptionName
  approvalGateSubscriptionName
  webhooksSubscriptionName
  historySubscriptionName
]
// Without Teams the teams subscription is not deployed at all: nobody would read it, and its
// messages would expire into the dead-letter queue (and fire the dead-letter alert) every week.
var teamsSubscriptionNames = teamsEnabled ? [
  teamsSubscriptionName
] : []
var customSubscriptionNames = (customSubscriberEnabled && !empty(customSubscriptionName)) ? [
  customSubscriptionName
] : []
var functionAppSubscriptionNames = concat(teamsSubscriptionNames, builtInSubscriptionNames, customSubscriptionNames)

var teamsWebhookSecretName = 'teams-webhook-url'
// Agentless mode's containers in the host storage account.
var eventGridStateContainerName = 'sebridge-eventgrid-state'
var eventGridDeadLetterContainerName = 'sebridge-eventgrid-deadletters'
var approvalSigningKeySecretName = 'approval-signing-key'

module serviceBus 'modules/servicebus.bicep' = {
  name: 'servicebus'
  params: {
    location: location
    namespaceName: '${abbrs.serviceBusNamespace}${environmentName}-${resourceToken}'
    skuName: serviceBusSku
    premiumCapacity: serviceBusPremiumCapacity
    topicDuplicateDetectionWindow: topicDuplicateDetectionWindow
    omittedSubscriptionNames: teamsEnabled ? [] : [
      teamsSubscriptionName
    ]
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
    eventGridStateContainerName: eventGridStateContainerName
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
    teamsEnabled: teamsEnabled
    teamsSubscriptionName: teamsSubscriptionName
    lbPoolsSubscriptionName: lbPoolsSubscriptionName
    approvalGateSubscriptionName: approvalGateSubscriptionName
    webhooksSubscriptionName: webhooksSubscriptionName
    historySubscriptionName: historySubscriptionName
    historyRetentionDays: historyRetentionDays
    calendarWindowDays: calendarWindowDays
    approvalsQueueName: serviceBus.outputs.approvalsQueueName
    drainMomentsQueueName: serviceBus.outputs.drainMomentsQueueName
    keyVaultUri: keyVault.outputs.vaultUri
    teamsWebhookSecretName: teamsWebhookSecretName
    approvalSigningKeySecretName: approvalSigningKeySecretName
    approvalPolicy: approvalPolicy
    lbImpactfulEventTypes: lbImpactfulEventTypes
    lbFreezeThresholdSeconds: lbFreezeThresholdSeconds
    lbMinHealthy: lbMinHealthy
    lbMaxUnavailable: lbMaxUnavailable
    lbPoolBudgets: lbPoolBudgets
    lbManagedResourceGroups: lbManagedResourceGroups
    acknowledgeFallbackEnabled: acknowledgeFallbackEnabled
    heartbeatStaleSeconds: heartbeatStaleSeconds
    customSubscriberEnabled: customSubscriberEnabled
    customSubscriptionName: customSubscriptionName
    webhookEndpoints: webhookEndpoints
    webhookPagesPerObserverHour: webhookPagesPerObserverHour
    webhookSecretSettings: webhookSecretSettings
    heartbeatStoreUrl: storage.outputs.heartbeatContainerUrl
    maximumInstanceCount: functionMaximumInstanceCount
    eventGridIngestEnabled: agentlessIngest
    eventGridStateUrl: agentlessIngest ? 'https://${storage.outputs.name}.blob.${environment().suffixes.storage}/${eventGridStateContainerName}' : ''
    agentlessResourceGroups: agentlessResourceGroups
    agentlessVmPatterns: agentlessVmPatterns
  }
}

module agentlessStorage 'modules/agentless-storage.bicep' = if (agentlessIngest) {
  name: 'agentless-storage'
  params: {
    storageAccountName: storage.outputs.name
    stateContainerName: eventGridStateContainerName
    deadLetterContainerName: eventGridDeadLetterContainerName
  }
}

module eventGrid 'modules/eventgrid-ingest.bicep' = if (agentlessIngest && agentlessEventSubscription) {
  name: 'eventgrid-ingest'
  params: {
    systemTopicName: empty(agentlessSystemTopicName) ? '${abbrs.eventGridSystemTopic}sebridge-maintenance-${environmentName}' : agentlessSystemTopicName
    functionAppName: functionApp.outputs.name
    eventDeliverySchema: agentlessDeliverySchema
    storageAccountName: storage.outputs.name
    deadLetterContainerName: eventGridDeadLetterContainerName
    tags: allTags
  }
  dependsOn: [
    agentlessStorage
  ]
}

// One deployment per resource group holding VMs to opt in (cut to fit 64 characters).
module scheduledEventsPolicy 'modules/scheduled-events-policy.bicep' = [for target in scheduledEventsPolicyTargets: {
  name: '${take('scheduled-events-policy-${target.resourceGroup}', 50)}-${uniqueString(target.resourceGroup)}'
  scope: resourceGroup(target.resourceGroup)
  params: {
    vmNames: target.?vmNames ?? []
    vmssNames: target.?vmssNames ?? []
    availabilitySetNames: target.?availabilitySetNames ?? []
  }
}]

module functionAppRoles 'modules/functionapp-roles.bicep' = {
  name: 'functionapp-roles'
  params: {
    functionAppPrincipalId: functionApp.outputs.principalId
    storageAccountName: storage.outputs.name
    historyTableName: storage.outputs.historyTableName
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
    drainMomentsQueueName: serviceBus.outputs.drainMomentsQueueName
    functionAppPrincipalId: functionApp.outputs.principalId
    functionAppSubscriptionNames: functionAppSubscriptionNames
    forwarderPrincipalId: forwarderIdentity.outputs.principalId
    approvalSenderPrincipalIds: approvalSenderPrincipalIds
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

module alerts 'modules/alerts.bicep' = if (alertsEnabled) {
  name: 'alerts'
  params: {
    location: location
    namePrefix: '${abbrs.alertRule}sebridge-${environmentName}'
    namespaceName: serviceBus.outputs.namespaceName
    topicName: serviceBus.outputs.topicName
    approvalsQueueName: serviceBus.outputs.approvalsQueueName
    appInsightsName: monitoring.outputs.appInsightsName
    heartbeatStaleSeconds: heartbeatStaleSeconds
    actionGroupIds: alertActionGroupIds
    tags: allTags
  }
}

module workbook 'modules/workbook.bicep' = if (workbookEnabled) {
  name: 'workbook'
  params: {
    location: location
    appInsightsId: monitoring.outputs.appInsightsId
    displayName: 'Scheduled Events Bridge: fleet maintenance (${environmentName})'
    tags: allTags
  }
}

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

@description('The history\'s endpoints without their key: GET events (filters: state, vm, resourceGroup, from, to, limit), events/{eventId}, and the iCalendar feed. Append ?code=<function key> (calendarKeyCommand).')
output historyEndpoints object = {
  events: 'https://${functionApp.outputs.defaultHostName}/api/events'
  calendar: 'https://${functionApp.outputs.defaultHostName}/api/calendar.ics'
}

@description('The Azure CLI command that prints the calendar function\'s default key (never the key itself: whoever may read it there may use it).')
output calendarKeyCommand string = 'az functionapp function keys list --resource-group ${resourceGroup().name} --name ${functionApp.outputs.name} --function-name calendar --query default --output tsv'

@description('Name of the Key Vault that holds the app\'s secrets.')
output keyVaultName string = keyVault.outputs.name

@description('Secret names to set after deployment (az keyvault secret set).')
output keyVaultSecretNames object = {
  teamsWebhookUrl: teamsEnabled ? teamsWebhookSecretName : ''
  approvalSigningKey: approvalSigningKeySecretName
  webhooks: [for setting in webhookSecretSettings: toLower(replace(setting, '_', '-'))]
}

@description('Client id of the forwarders\' identity (AZURE_CLIENT_ID on the VMs).')
output forwarderIdentityClientId string = forwarderIdentity.outputs.clientId

@description('Resource id of the forwarders\' identity (attach it to VMs and scale sets).')
output forwarderIdentityResourceId string = forwarderIdentity.outputs.id

@description('Principal id of the forwarders\' identity.')
output forwarderIdentityPrincipalId string = forwarderIdentity.outputs.principalId

@description('Principal id of the Function App\'s system-assigned identity.')
output functionAppPrincipalId string = functionApp.outputs.principalId
