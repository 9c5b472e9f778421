// Agentless mode's blob containers in the host storage account: the ingestion function's
// per-event records (EVENTGRID_STATE_URL; the app's Storage Blob Data Owner grant on the account
// covers them) and the Event Grid dead letters (written by the system topic's identity,
// eventgrid-deadletter-role.bicep).

@description('Name of the host storage account.')
param storageAccountName string

@description('Container for the ingestion function\'s per-event records.')
param stateContainerName string

@description('Container Event Grid writes undeliverable notifications to.')
param deadLetterContainerName string

resource storage 'Microsoft.Storage/storageAccounts@2023-05-01' existing = {
  name: storageAccountName
}

resource blobService 'Microsoft.Storage/storageAccounts/blobServices@2023-05-01' existing = {
  parent: storage
  name: 'default'
}

resource stateContainer 'Microsoft.Storage/storageAccounts/blobServices/containers@2023-05-01' = {
  parent: blobService
  name: stateContainerName
  properties: {
    publicAccess: 'None'
  }
}

resource deadLetterContainer 'Microsoft.Storage/storageAccounts/blobServices/containers@2023-05-01' = {
  parent: blobService
  name: deadLetterContainerName
  properties: {
    publicAccess: 'None'
  }
}

@description('URL of the per-event record container (EVENTGRID_STATE_URL).')
output stateContainerUrl string = '${storage.properties.primaryEndpoints.blob}${stateContainer.name}'

@description('Name of the dead-letter container.')
output deadLetterContainerName string = deadLetterContainer.name
