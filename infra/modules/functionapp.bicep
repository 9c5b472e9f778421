// The workflows' Function App on Flex Consumption, with every app setting the functions read.
//
// Identity: system-assigned. The app is the only user of its identity, so the grants live and
// die with the app (deleting the app leaves no orphaned principal with Service Bus or Network
// rights), and every identity-based connection (triggers, host storage, Key Vault references,
// Application Insights, the SDK clients the functions build with DefaultAzureCredential) works
// without a client id to thread through each setting. The forwarders, which are many machines,
// get a user-assigned identity instead (identity.bicep).

@description('Azure region.')
param location string

@description('Name of the Function App (globally unique host name).')
param name string

@description('Name of the Flex Consumption plan.')
param planName string

@description('Tags for every resource.')
param tags object = {}

@description('Name of the host storage account (AzureWebJobsStorage, identity-based).')
param storageAccountName string

@description('URL of the blob container for the deployment package.')
param deploymentContainerUrl string

@description('Application Insights connection string.')
param appInsightsConnectionString string

@description('Fully qualified Service Bus namespace.')
param serviceBusFullyQualifiedNamespace string

@description('Name of the scheduled-events topic.')
param topicName string

@description('Post Teams cards: set TEAMS_WEBHOOK_URL (a Key Vault reference) and TeamsSubscriptionName. false: neither is set, and the app runs without the teams workflow (webhookEndpoints must then list an endpoint).')
param teamsEnabled bool = true

@description('Subscription the teams workflow reads.')
param teamsSubscriptionName string

@description('Subscription the lb-pools workflow reads.')
param lbPoolsSubscriptionName string

@description('Subscription the approval gate reads.')
param approvalGateSubscriptionName string

@description('Subscription the webhooks workflow reads.')
param webhooksSubscriptionName string

@description('Subscription the history workflow reads.')
param historySubscriptionName string

@description('Days an event stays in the history after its last entry (HISTORY_RETENTION_DAYS).')
@minValue(1)
@maxValue(3650)
param historyRetentionDays int = 90

@description('Days before and after now that the calendar feed covers (CALENDAR_WINDOW_DAYS).')
@minValue(1)
@maxValue(366)
param calendarWindowDays int = 30

@description('Webhook endpoints (WEBHOOKS, JSON); secrets only by the name of the app setting holding them.')
param webhookEndpoints array = []

@description('New PagerDuty incidents one VM\'s reports may open per hour (WEBHOOK_PAGES_PER_OBSERVER_HOUR).')
@minValue(1)
@maxValue(1000)
param webhookPagesPerObserverHour int = 10

@description('App settings holding webhook secrets: each becomes a Key Vault reference to the secret named like it in lower case with dashes (WEBHOOK_OPS_SLACK_URL -> webhook-ops-slack-url). Names: letters, digits and underscores.')
param webhookSecretSettings array = []

@description('Queue the approval gate sends approve commands to.')
param approvalsQueueName string

@description('Queue lb-pools schedules its drain moments on (DrainMomentsQueueName): it drains at NotBefore minus the lead of APPROVAL_POLICY leadSeconds.')
param drainMomentsQueueName string

@description('Key Vault URI (ends with a slash).')
param keyVaultUri string

@description('Key Vault secret holding the Teams Workflows webhook URL.')
param teamsWebhookSecretName string

@description('Key Vault secret holding the HMAC key that signs Approve links.')
param approvalSigningKeySecretName string

@description('Approval policy as JSON; empty leaves APPROVAL_POLICY unset so the documented default applies.')
param approvalPolicy string = ''

@description('Event types for which lb-pools takes VMs out of their pools.')
param lbImpactfulEventTypes string = 'Reboot,Redeploy,Preempt,Terminate'

@description('A Freeze at most this long (seconds) leaves the VM in its pools.')
@minValue(0)
param lbFreezeThresholdSeconds int = 9

@description('Resource groups whose load balancer pools lb-pools may change.')
param lbManagedResourceGroups array = []

@description('Fewest healthy members lb-pools leaves in a backend pool (0: no capacity guard).')
@minValue(0)
@maxValue(1000)
param lbMinHealthy int = 1

@description('Most members of a backend pool that may be out at once (LB_MAX_UNAVAILABLE): a count or a percentage; empty: no maximum.')
param lbMaxUnavailable string = ''

@description('Disruption budgets per pool (LB_POOL_BUDGETS), JSON; empty: the global ones for every pool.')
param lbPoolBudgets string = ''

@description('Use the ARM acknowledge API when the observing forwarder is silent.')
param acknowledgeFallbackEnabled bool = false

@description('A forwarder without a Heartbeat for this long (seconds) counts as silent.')
@minValue(60)
param heartbeatStaleSeconds int = 900

@description('Enable your own subscriber function.')
param customSubscriberEnabled bool = false

@description('Subscription your own subscriber function reads (empty while it is disabled).')
param customSubscriptionName string = ''

@description('Blob container URL where the approval gate keeps the last Heartbeat per forwarder (used by the acknowledge fallback).')
param heartbeatStoreUrl string

@description('Upper bound of Flex Consumption instances.')
@minValue(1)
@maxValue(1000)
param maximumInstanceCount int = 40

@description('Run the Event Grid ingestion function (agentless mode).')
param eventGridIngestEnabled bool = false

@description('Blob container URL for the ingestion function\'s per-event records (empty while it is disabled).')
param eventGridStateUrl string = ''

@description('Resource groups whose VMs run no forwarder (the gate acknowledges through ARM).')
param agentlessResourceGroups array = []

@description('VM and scale-set name patterns that run no forwarder.')
param agentlessVmPatterns array = []

@description('Memory per instance (MB).')
@allowed([
  512
  2048
  4096
])
param instanceMemoryMB int = 2048

// environment() rather than a literal so sovereign clouds get their own ARM endpoint.
var armEndpoint = endsWith(environment().resourceManager, '/') ? substring(environment().resourceManager, 0, length(environment().resourceManager) - 1) : environment().resourceManager

// Every setting the functions read (functions/settings.py); tests/infra/test_infra_function_app.py
// checks the two lists agree. Flex Consumption sets FUNCTIONS_WORKER_RUNTIME, the extension
// version and the package location itself and rejects them as app settings.
var requiredSettings = {
  AzureWebJobsStorage__accountName: storageAccountName
  APPLICATIONINSIGHTS_CONNECTION_STRING: appInsightsConnectionString
  // Entra token instead of the instrumentation key: App Insights has local auth disabled.
  APPLICATIONINSIGHTS_AUTHENTICATION_STRING: 'Authorization=AAD'
  ServiceBusConnection__fullyQualifiedNamespace: serviceBusFullyQualifiedNamespace
  TopicName: topicName
  LbPoolsSubscriptionName: lbPoolsSubscriptionName
  ApprovalGateSubscriptionName: approvalGateSubscriptionName
  WebhooksSubscriptionName: webhooksSubscriptionName
  // HISTORY_TABLE_URL is left unset: the app uses the table sebridgehistory of its host storage
  // account, created by storage.bicep.
  HistorySubscriptionName: historySubscriptionName
  HISTORY_RETENTION_DAYS: string(historyRetentionDays)
  CALENDAR_WINDOW_DAYS: string(calendarWindowDays)
  ApprovalsQueueName: approvalsQueueName
  DrainMomentsQueueName: drainMomentsQueueName
  CustomSubscriptionName: customSubscriptionName
  // Versionless references: a rotated secret is picked up without a redeployment.
  APPROVAL_SIGNING_KEY: '@Microsoft.KeyVault(SecretUri=${keyVaultUri}secrets/${approvalSigningKeySecretName})'
  APPROVAL_BASE_URL: 'https://${functionApp.properties.defaultHostName}'
  LB_IMPACTFUL_EVENT_TYPES: lbImpactfulEventTypes
  LB_FREEZE_THRESHOLD_SECONDS: string(lbFreezeThresholdSeconds)
  LB_MANAGED_RESOURCE_GROUPS: join(lbManagedResourceGroups, ',')
  // LB_POOL_STATE_URL is left unset: the app uses the container sebridge-pools of its host
  // storage account (AzureWebJobsStorage__accountName), created by storage.bicep.
  LB_MIN_HEALTHY: string(lbMinHealthy)
  LB_MAX_UNAVAILABLE: lbMaxUnavailable
  LB_POOL_BUDGETS: lbPoolBudgets
  ARM_ENDPOINT: armEndpoint
  ACKNOWLEDGE_FALLBACK_ENABLED: acknowledgeFallbackEnabled ? 'true' : 'false'
  HEARTBEAT_STALE_SECONDS: string(heartbeatStaleSeconds)
  HEARTBEAT_STORE_URL: heartbeatStoreUrl
  CUSTOM_SUBSCRIBER_ENABLED: customSubscriberEnabled ? 'true' : 'false'
  WEBHOOKS: string(webhookEndpoints)
  WEBHOOK_PAGES_PER_OBSERVER_HOUR: string(webhookPagesPerObserverHour)
  EVENTGRID_INGEST_ENABLED: eventGridIngestEnabled ? 'true' : 'false'
  EVENTGRID_STATE_URL: eventGridStateUrl
  AGENTLESS_RESOURCE_GROUPS: join(agentlessResourceGroups, ',')
  AGENTLESS_VM_PATTERNS: join(agentlessVmPatterns, ',')
  // The Python worker runs sync functions on this many threads, shared by every function of an
  // instance (unset: min(32, cores + 4)). The workflows wait on ARM, storage and Service Bus,
  // and a burst keeps many invocations waiting (benchmarks/burst.py): as many threads as
  // maxConcurrentSessions in host.json, so no received message waits for one (no cap past 3.7).
  PYTHON_THREADPOOL_THREAD_COUNT: '64'
}

// The webhook secrets' settings, one versionless Key Vault reference each. Their names come from
// a parameter, so the object is built as JSON text (checkov's parser takes no lambdas, which
// toObject would need); the names are app-setting names, which hold no quote to break it.
var webhookSecretEntries = [for setting in webhookSecretSettings: '"${setting}":"@Microsoft.KeyVault(SecretUri=${keyVaultUri}secrets/${toLower(replace(setting, '_', '-'))})"']
var webhookSecretAppSettings = json('{${join(webhookSecretEntries, ',')}}')

// Set only when given: unset means "use the documented default policy".
var optionalSettings = empty(approvalPolicy) ? {} : {
  APPROVAL_POLICY: approvalPolicy
}

// Teams only when it is used: without TEAMS_WEBHOOK_URL the app runs no teams workflow (and
// expects a webhook endpoint instead), and no Teams secret is then looked for in the vault.
var teamsSettings = teamsEnabled ? {
  TeamsSubscriptionName: teamsSubscriptionName
  TEAMS_WEBHOOK_URL: '@Microsoft.KeyVault(SecretUri=${keyVaultUri}secrets/${teamsWebhookSecretName})'
} : {}

resource plan 'Microsoft.Web/serverfarms@2024-04-01' = {
  //checkov:skip=CKV_AZURE_225:Flex Consumption zone redundancy exists only in some regions; the handlers are idempotent and Service Bus keeps messages while an instance is replaced.
  name: planName
  location: location
  tags: tags
  kind: 'functionapp'
  sku: {
    name: 'FC1'
    tier: 'FlexConsumption'
  }
  properties: {
    reserved: true
  }
}

resource functionApp 'Microsoft.Web/sites@2024-04-01' = {
  //checkov:skip=CKV_AZURE_222:Approve links are opened from Teams in people's browsers, so the app has a public endpoint; add VNet integration and access restrictions per tenant (docs/deploy.md).
  //checkov:skip=CKV_AZURE_17:Browsers open the Approve links; they hold no client certificate. The link carries an HMAC-signed expiring token instead.
  //checkov:skip=CKV_AZURE_212:Flex Consumption scales from zero on Service Bus triggers; messages wait in their sessions while an instance starts, so no always-ready instance is paid for.
  //checkov:skip=CKV_AZURE_213:Flex Consumption has no App Service health check; the Functions host restarts unhealthy instances and Application Insights alerts on failures.
  name: name
  location: location
  tags: tags
  kind: 'functionapp,linux'
  identity: {
    type: 'SystemAssigned'
  }
  properties: {
    serverFarmId: plan.id
    httpsOnly: true
    keyVaultReferenceIdentity: 'SystemAssigned'
    siteConfig: {
      minTlsVersion: '1.2'
      scmMinTlsVersion: '1.2'
      ftpsState: 'Disabled'
      http20Enabled: true
    }
    functionAppConfig: {
      deployment: {
        storage: {
          type: 'blobContainer'
          value: deploymentContainerUrl
          authentication: {
            type: 'SystemAssignedIdentity'
          }
        }
      }
      scaleAndConcurrency: {
        maximumInstanceCount: maximumInstanceCount
        instanceMemoryMB: instanceMemoryMB
      }
      runtime: {
        name: 'python'
        version: '3.11'
      }
    }
  }
}

// A child resource rather than siteConfig.appSettings: APPROVAL_BASE_URL needs the app's own
// host name, which the site cannot reference while it is being created.
resource appSettings 'Microsoft.Web/sites/config@2024-04-01' = {
  // checkov reads this appsettings resource as a site configuration; the web-server checks do not apply:
  //checkov:skip=CKV_AZURE_13:The one HTTP function (Approve link) authorises with its HMAC-signed expiring token; App Service authentication would send browsers to an Entra login the approvers may not have.
  //checkov:skip=CKV_AZURE_63:No web server logs on Flex Consumption; requests and traces go to Application Insights.
  //checkov:skip=CKV_AZURE_65:No web server logs on Flex Consumption; errors go to Application Insights.
  //checkov:skip=CKV_AZURE_66:No web server logs on Flex Consumption; failed requests go to Application Insights.
  //checkov:skip=CKV_AZURE_80:Python app, no .NET Framework.
  //checkov:skip=CKV_AZURE_88:Flex Consumption does not use Azure Files; host storage and the package are identity-based blobs.
  //checkov:skip=CKV_AZURE_222:Public endpoint needed for the Approve links (see the site resource).
  parent: functionApp
  name: 'appsettings'
  // Webhook secrets first, so that none can replace a setting of the bridge's own.
  properties: union(webhookSecretAppSettings, requiredSettings, teamsSettings, optionalSettings)
}

// No FTP or basic-auth SCM publishing: deployments go through Entra ID.
resource ftpPublishing 'Microsoft.Web/sites/basicPublishingCredentialsPolicies@2024-04-01' = {
  parent: functionApp
  name: 'ftp'
  properties: {
    allow: false
  }
}

resource scmPublishing 'Microsoft.Web/sites/basicPublishingCredentialsPolicies@2024-04-01' = {
  parent: functionApp
  name: 'scm'
  properties: {
    allow: false
  }
}

@description('Name of the Function App.')
output name string = functionApp.name

@description('Default host name of the Function App.')
output defaultHostName string = functionApp.properties.defaultHostName

@description('Principal id of the app\'s system-assigned identity.')
output principalId string = functionApp.identity.principalId
