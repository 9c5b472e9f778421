// Agentless mode (preview): the scheduled events Azure publishes for opted-in VMs, scale sets and
// availability sets (system topic type Microsoft.ResourceNotifications.MaintenanceResources,
// location global, source this subscription) delivered to the ingestion function
// (function_app.py: eventgrid_ingest), filtered to the one event type it reads.
//
// Delivery: endpointType AzureFunction with the function's resource id. Event Grid fetches the
// function's system key (eventgrid_extension) through ARM itself, so no key or URL appears
// here, in the deployment or in any setting, and the key rotates without a redeployment. Event
// Grid's managed-identity delivery (deliveryWithResourceIdentity) takes Service Bus, Event Hubs
// and Storage queue destinations but not an Azure Function; an Entra-protected webhook
// destination would need an app registration (not deployable from Bicep) and App Service
// authentication in front of the host's /runtime/webhooks/EventGrid endpoint. The identity is
// used where Event Grid supports it: the topic dead-letters with its own system-assigned
// identity into one container of the host storage account (shared keys are off there).
// The function must exist before this deploys (Event Grid checks the endpoint): deploy the
// code first (docs/agentless.md).

@description('Name of the system topic. A subscription holds one system topic per topic type and source: if it already has one for Microsoft.ResourceNotifications.MaintenanceResources, give its name (it must be in this resource group).')
param systemTopicName string

@description('Name of the Function App.')
param functionAppName string

@description('Name of the ingestion function.')
param functionName string = 'eventgrid_ingest'

@description('Schema Event Grid delivers in (the function reads both).')
@allowed([
  'EventGridSchema'
  'CloudEventSchemaV1_0'
])
param eventDeliverySchema string = 'EventGridSchema'

@description('Name of the host storage account (dead letters).')
param storageAccountName string

@description('Container Event Grid writes undeliverable notifications to.')
param deadLetterContainerName string

@description('Tags for every resource.')
param tags object = {}

var eventType = 'Microsoft.ResourceNotifications.MaintenanceResources.ScheduledEventEmitted'

resource functionApp 'Microsoft.Web/sites@2024-04-01' existing = {
  name: functionAppName
}

resource storage 'Microsoft.Storage/storageAccounts@2023-05-01' existing = {
  name: storageAccountName
}

resource systemTopic 'Microsoft.EventGrid/systemTopics@2022-06-15' = {
  name: systemTopicName
  location: 'global'
  tags: tags
  identity: {
    type: 'SystemAssigned'
  }
  properties: {
    source: subscription().id
    topicType: 'Microsoft.ResourceNotifications.MaintenanceResources'
  }
}

module deadLetterRole 'eventgrid-deadletter-role.bicep' = {
  name: 'sebridge-eventgrid-deadletter-role'
  params: {
    systemTopicPrincipalId: systemTopic.identity.principalId
    storageAccountName: storageAccountName
    deadLetterContainerName: deadLetterContainerName
  }
}

resource toIngestion 'Microsoft.EventGrid/systemTopics/eventSubscriptions@2022-06-15' = {
  parent: systemTopic
  name: 'sebridge-eventgrid-ingest'
  properties: {
    destination: {
      endpointType: 'AzureFunction'
      properties: {
        resourceId: '${functionApp.id}/functions/${functionName}'
        // One event per request: each is one invocation anyway, and a failure then makes
        // Event Grid redeliver only that notification.
        maxEventsPerBatch: 1
        preferredBatchSizeInKilobytes: 64
      }
    }
    eventDeliverySchema: eventDeliverySchema
    filter: {
      includedEventTypes: [
        eventType
      ]
    }
    // Event Grid's maximum: the ingestion is idempotent, so a day of redeliveries is harmless.
    retryPolicy: {
      maxDeliveryAttempts: 30
      eventTimeToLiveInMinutes: 1440
    }
    deadLetterWithResourceIdentity: {
      identity: {
        type: 'SystemAssigned'
      }
      deadLetterDestination: {
        endpointType: 'StorageBlob'
        properties: {
          resourceId: storage.id
          blobContainerName: deadLetterContainerName
        }
      }
    }
  }
  dependsOn: [
    deadLetterRole
  ]
}

@description('Name of the system topic.')
output systemTopicName string = systemTopic.name

@description('Principal id of the system topic\'s identity (Storage Blob Data Contributor on the dead-letter container).')
output systemTopicPrincipalId string = systemTopic.identity.principalId
